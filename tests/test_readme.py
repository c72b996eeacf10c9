"""The Python blocks of the README and of docs/usage.md run as written (small shapes, so a CPU under the
interpreter is enough)."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/usage.md")
BLOCKS = {page: re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S) for page in PAGES}
CASES = [(page, i, code) for page, blocks in BLOCKS.items() for i, code in enumerate(blocks)]


@pytest.mark.parametrize("page", PAGES)
def test_page_has_python_blocks(page):
    assert BLOCKS[page], f"{page} lost its ```python examples"


def test_readme_stays_short():
    """The README is the first run; reference material lives in docs/."""
    assert len((ROOT / "README.md").read_bytes()) <= 10_000


@pytest.mark.parametrize("page,index,code", CASES, ids=[f"{page}-block{i}" for page, i, _ in CASES])
def test_block_runs(page, index, code, capsys):
    exec(compile(code, f"{page} python block {index}", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out
    if "relative_error(" in code:  # the example prints its error against the float32 reference last
        assert float(printed.split()[-1]) < 1e-2
