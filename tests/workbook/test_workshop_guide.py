"""docs/workshop.md, the facilitator's guide, says what the repository does: the files, make targets,
Makefile numbers, results files and checker entry points it quotes exist and are what it says. Text only,
no kernel."""

import glob
import os
import re

import pytest

from moe_lab.workbook import exercises
from moe_lab.workbook.viz import fp8 as fp8_viz
from moe_lab.workbook.viz.performance import load_results, results_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUIDE = open(os.path.join(ROOT, "docs", "workshop.md")).read()
MAKEFILE = open(os.path.join(ROOT, "Makefile")).read()
CODE = re.findall(r"`([^`\n]+)`", GUIDE)  # every `code span`
# A span that names a file of the repository: a relative path with a folder and a file extension.
PATHS = sorted(
    {
        span
        for span in CODE
        if re.fullmatch(r"(notebooks|docs|benchmarks|moe_lab|tests)/[\w./-]+\.\w+", span) and "*" not in span
    }
)


def test_the_guide_is_shorter_than_it_was():
    assert len(GUIDE.encode()) < 35_000


@pytest.mark.parametrize("path", PATHS)
def test_quoted_files_exist(path):
    assert os.path.exists(os.path.join(ROOT, path)), f"docs/workshop.md quotes {path}, which does not exist"


def test_linked_pages_exist():
    for page in re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]+)?\)", GUIDE):
        assert os.path.exists(os.path.join(ROOT, "docs", page)), page


def test_quoted_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", MAKEFILE, flags=re.M))
    quoted = set(re.findall(r"`make ([\w-]+)", GUIDE))
    assert quoted, "the guide quotes no make target"
    assert quoted <= targets, f"targets the Makefile lacks: {sorted(quoted - targets)}"


def test_the_notebooks_timeout_is_the_makefiles():
    makefile = re.search(r"--ExecutePreprocessor\.timeout=(\d+)", MAKEFILE).group(1)
    quoted = set(re.findall(r"--ExecutePreprocessor\.timeout=(\d+)", GUIDE))
    assert quoted == {makefile}, f"the guide says {quoted}, the Makefile {makefile}"


def test_the_committed_results_named_are_the_ones_read():
    newest = os.path.basename(load_results()["path"])
    named = set(re.findall(r"bench-NVIDIA_H200-[\w-]+\.json", GUIDE))
    assert named == {newest}, f"05 and 07 read {newest}; the guide names {sorted(named)}"
    assert f"benchmarks/results/studies/{fp8_viz.FP8_EXPERIMENT}" in GUIDE
    nb09 = open(os.path.join(ROOT, "notebooks", "09_fp8.py")).read()
    for name in re.findall(r"bench-fp8-[\w-]+\.json", GUIDE):
        assert name in nb09 and os.path.exists(os.path.join(results_dir(), "fp8", name)), name


def test_every_notebook_has_a_row_in_the_times_table():
    rows = set(re.findall(r"^\| (\d\d\w*?_\w+) \|", GUIDE, flags=re.M))
    notebooks = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(ROOT, "notebooks", "[0-9]*.py"))}
    assert notebooks <= rows, f"notebooks without a row: {sorted(notebooks - rows)}"


def test_the_h200_times_are_the_logs_newest():
    """Each H200 time in the table is the last one `benchmarks/results/notebooks-NVIDIA_H200.txt` records."""
    log = open(os.path.join(ROOT, "benchmarks", "results", "notebooks-NVIDIA_H200.txt")).read()
    newest = {name: int(s) for name, s in re.findall(r"^(\d\d\w*?_\w+)\s+exit 0\s+(\d+) s", log, flags=re.M)}
    rows = re.findall(r"^\| (\d\d\w*?_\w+) \| [^|]+ \| ([^|]+) \|$", GUIDE, flags=re.M)
    assert len(rows) >= 10, "the times table has lost its rows"
    for name, h200 in rows:
        want = str(newest[name]) if name in newest else "-"
        assert h200.strip() == want, f"{name}: the guide says {h200.strip()}, the log's newest run {want}"


def test_quoted_checkers_exist():
    for name in set(re.findall(r"exercises\.(check_\w+)", GUIDE)):
        assert callable(getattr(exercises, name, None)), name


def test_section_links_lead_to_headings():
    def slug(heading):  # GitHub's: lower case, punctuation dropped, spaces to hyphens
        return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")

    headings = {slug(h) for h in re.findall(r"^#+ (.+)$", GUIDE, flags=re.M)}
    for anchor in re.findall(r"\]\(#([\w-]+)\)", GUIDE):
        assert anchor in headings, f"#{anchor} leads to no heading"
