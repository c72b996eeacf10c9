"""The README's Python blocks run as written (small shapes, so a CPU under the interpreter is enough)."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert BLOCKS, "README.md lost its ```python examples"


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(code, capsys):
    exec(compile(code, f"README.md python block", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    if "relative_error(" in code:  # the example prints its error against the float32 reference last
        assert float(printed.split()[-1]) < 1e-2
