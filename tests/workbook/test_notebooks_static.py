"""The stored notebooks as static viewers see them (GitHub, nbviewer, `jupyter nbconvert --to html`).

A viewer draws a widget only from the widget state stored in the notebook's metadata
(`metadata.widgets`, written by `make notebooks`); without it it prints the widget's text repr,
`VBox(children=(SelectionSlider(...`. No kernel: reads the .ipynb files and exports HTML in-process.
"""

import glob
import html
import json
import os
import re

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "0*.ipynb")))
VIEW = "application/vnd.jupyter.widget-view+json"
STATE = "application/vnd.jupyter.widget-state+json"
# What a viewer prints in place of a widget it cannot draw.
BARE_REPR = re.compile(r"\b(VBox|HBox|Box|GridBox|Tab|Accordion)\(children=|\bOutput\((layout|outputs|msg_id)=")

pytestmark = pytest.mark.skipif(not NOTEBOOKS, reason="no notebooks/0*.ipynb")


def read(path):
    return nbformat.read(path, as_version=4)


def widget_views(nb):
    """(cell index, output) of every output that shows a widget."""
    return [
        (i, out) for i, cell in enumerate(nb.cells) for out in cell.get("outputs", []) if VIEW in out.get("data", {})
    ]


def stored_state(nb):
    return nb.metadata.get("widgets", {}).get(STATE, {}).get("state", {})


def model_tree(state, model_id):
    """Ids of `model_id` and every model it refers to ("IPY_MODEL_<id>": children, layout, style)."""
    seen, todo = set(), [model_id]
    while todo:
        mid = todo.pop()
        if mid in seen:
            continue
        assert mid in state, f"model {mid} is referred to but not stored"
        seen.add(mid)
        todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[mid]["state"]))
    return seen


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_every_widget_view_has_its_state_stored(path):
    nb = read(path)
    state = stored_state(nb)
    for i, out in widget_views(nb):
        tree = model_tree(state, out["data"][VIEW]["model_id"])
        for mid in tree:
            model = state[mid]
            assert model["model_name"] and model["model_module"] and model["model_module_version"], mid
        for mid in (m for m in tree if state[m]["model_name"] == "OutputModel"):
            out_state = state[mid]["state"]
            assert out_state.get("msg_id", "") == "", f"cell {i}: stored Output is still capturing"
            # The widget's picture, stored once: in its Output widget, not a second time in the cell.
            pictures = [o for o in out_state.get("outputs", []) if "image/png" in o.get("data", {})]
            assert len(pictures) == 1, f"cell {i}: the Output widget stores {len(pictures)} pictures"
        assert not any(k.startswith("image/") for o in nb.cells[i].outputs for k in o.get("data", {})), (
            f"cell {i}: the widget's figure is also a cell output"
        )
    if not widget_views(nb):
        assert not state, "widget state stored for a notebook without widgets"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_no_volatile_metadata(path):
    nb = read(path)
    for i, cell in enumerate(nb.cells):
        assert "execution" not in cell.metadata, f"cell {i} keeps execution timestamps"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_html_export_draws_widgets(path):
    from nbconvert import HTMLExporter

    nb = read(path)
    body, _ = HTMLExporter().from_notebook_node(nb)
    views = widget_views(nb)
    if views:
        assert f'<script type="{STATE}">' in body, "no widget state script in the HTML"
        assert body.count(f'<script type="{VIEW}">') == len(views)
    found = BARE_REPR.search(body)
    assert found is None, f"a widget's text repr in place of the widget: ...{body[found.start() : found.end() + 60]}"
    for _, out in views:
        text = "".join(out["data"].get("text/plain", ""))
        assert html.escape(text) not in body and text not in body, f"widget shown as text: {text[:80]}"


def test_the_makefile_lists_the_notebooks_with_widgets():
    """`make test-widgets7` runs only the notebooks of WIDGET_NOTEBOOKS under ipywidgets 7: exactly those whose
    stored outputs show a widget."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        makefile = f.read()
    listed = re.search(r"^WIDGET_NOTEBOOKS := \$\(addprefix notebooks/,(.*?)\)$", makefile, flags=re.M | re.S)
    assert listed, "no WIDGET_NOTEBOOKS in the Makefile"
    with_widgets = [os.path.basename(p) for p in NOTEBOOKS if widget_views(read(p))]
    assert sorted(listed.group(1).replace("\\", " ").split()) == with_widgets
