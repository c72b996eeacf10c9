"""Kernels defined in the notebooks' py:percent sources, for tests of the exercise checkers: the tests
grade the notebooks' own solutions, so a solution and its checker cannot drift apart; and the one check of
a wrong kernel that they all make."""

import ast
import os
import re

import pytest
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


def notebook_kernel(notebook: str, name: str, **names):
    """The function `name` of notebooks/<notebook>.py (a `@triton.jit` kernel or a helper), defined afresh
    (torch, triton, tl, TensorDescriptor, the notebook's top-level constants and `names`, such as a helper
    the notebook imports, in scope)."""
    path = os.path.join(NOTEBOOKS, f"{notebook}.py")
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    scope = {"torch": torch, "triton": triton, "tl": tl, "TensorDescriptor": TensorDescriptor, **names}
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            try:
                exec(compile(ast.Module([node], []), path, "exec"), scope)  # constants such as BLOCK = 64
            except Exception:  # noqa: BLE001 - a constant computed from notebook state: not needed here
                pass
        if isinstance(node, ast.FunctionDef) and node.name == name:
            exec(compile(ast.Module([node], []), path, "exec"), scope)
            return scope[name]
    raise LookupError(f"no function {name} in {path}")


def assert_not_yet(checker, kernel, words, exercise, capsys):
    """`checker(kernel)` says NOT YET with each of `words` in its message, prints a line that starts with
    "NOT YET <exercise>: ", and with strict=True raises an AssertionError that starts with "FAIL <exercise>: "."""
    verdict = checker(kernel)
    assert verdict.status == "NOT YET", verdict
    for text in words:
        assert text in verdict.message, verdict.message
    assert capsys.readouterr().out.startswith(f"NOT YET {exercise}: ")
    with pytest.raises(AssertionError, match=f"^FAIL {re.escape(exercise)}: "):
        checker(kernel, strict=True)
