"""The widget builders in a real Jupyter kernel, driven the way a widget front end drives them.

Each builder runs in a kernel; the test keeps what a front end keeps (the models from `comm_open` and their
`update`s, and what each Output widget captures: the outputs whose parent message is the Output's `msg_id`)
and checks that the widget's picture lands in its Output widget as an image, not in the cell. Then it moves a
control with a comm `update` message, as a front end does when a slider is released, and checks the redraw.
The protocol differs between ipywidgets 7.7 (models 1.x, `display_data`) and 8 (models 2.x, `execute_result`,
`echo_update`); `make test-widgets7` runs this file with ipywidgets 7.7.1, `make test` with 8. One kernel for
the module, no `%matplotlib inline` in it (the builders must draw without it).
"""

import json
import queue

import pytest

pytest.importorskip("ipykernel")
jupyter_client = pytest.importorskip("jupyter_client")
ipywidgets = pytest.importorskip("ipywidgets")

VIEW = "application/vnd.jupyter.widget-view+json"
OUTPUTS = ("display_data", "execute_result", "stream", "clear_output", "error")

SETUP = """
import torch, ipywidgets, moe_lab
from moe_lab.workbook.viz import align, dataflow, performance, routing, tiles, tma
ids = moe_lab.topk_routing(routing.skewed_router_logits(32, 8, seed=1), 2).topk_ids
print(ipywidgets.__version__)
"""

# builder: (code that makes widget `w`, the control to move, the state a front end sends for it)
# Selection widgets (SelectionSlider, Dropdown, ToggleButtons) sync `index`, sliders `value`, in 7.7 and 8 alike.
BUILDERS = {
    "routing_explorer": ("routing.routing_explorer()", "w.controls['skew']", {"value": 2.0}),
    "align_explorer": ("align.align_explorer({'prefill': ids, 'decode': ids[:2]}, 8)", "w.control", {"index": 2}),
    "tiles_explorer": ("tiles.tiles_explorer(ids, 8, n=64, k=32)", "w.controls['BLOCK_SIZE_M']", {"index": 2}),
    "box_widget": ("tma.box_widget()", "w.children[0].children[0]", {"value": 8}),
    "expert_tiles_widget": ("tma.expert_tiles_widget()", "w.children[0].children[1]", {"index": 1}),
    "dataflow_widget": ("dataflow.dataflow_widget()", "w.children[0].children[1]", {"value": 256}),
    "block_size_widget": ("performance.block_size_widget()", "w.children[0].children[1]", {"index": 0}),
}


class FrontEnd:
    """The part of a widget front end that matters here: model states and the Output widgets' capture."""

    def __init__(self):
        self.models = {}  # comm_id -> state
        self.captured = {}  # Output comm_id -> outputs it shows
        self._clear_next = set()

    def output_for(self, parent_id):
        """The Output widget capturing messages of `parent_id` now (its msg_id), or None (the cell)."""
        return next(
            (
                cid
                for cid, s in self.models.items()
                if s.get("_model_name") == "OutputModel" and s.get("msg_id") == parent_id
            ),
            None,
        )

    def feed(self, msgs, cell):
        for msg in msgs:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
                self.models[content["comm_id"]] = dict(content["data"]["state"])
            elif kind == "comm_msg" and content["data"].get("method") in ("update", "echo_update"):
                self.models[content["comm_id"]].update(content["data"]["state"])
            elif kind in OUTPUTS:
                target = self.output_for(msg["parent_header"].get("msg_id"))
                if target is None:
                    cell.append(msg)
                    continue
                shown = self.captured.setdefault(target, [])
                if kind == "clear_output":
                    if content.get("wait"):
                        self._clear_next.add(target)
                    else:
                        shown.clear()
                    continue
                if target in self._clear_next:
                    shown.clear()
                    self._clear_next.discard(target)
                shown.append(msg)

    def tree(self, model_id):
        """Ids of `model_id` and every model it refers to (children, layout, style)."""
        seen, todo = set(), [model_id]
        while todo:
            mid = todo.pop()
            if mid in seen:
                continue
            seen.add(mid)
            text = json.dumps(self.models[mid])
            todo += [ref.split('"')[0] for ref in text.split("IPY_MODEL_")[1:]]
        return seen

    def state_of(self, model_id, name):
        return [self.models[mid] for mid in self.tree(model_id) if self.models[mid].get("_model_name") == name]

    def pictures(self, model_id):
        """The image/png of every output the Output widgets of `model_id`'s tree show."""
        outs = [cid for cid in self.tree(model_id) if self.models[cid].get("_model_name") == "OutputModel"]
        assert len(outs) == 1, f"expected one Output widget, found {len(outs)}"
        return [
            m["content"]["data"]["image/png"]
            for m in self.captured.get(outs[0], [])
            if "image/png" in m["content"].get("data", {})
        ]


@pytest.fixture(scope="module")
def kernel():
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        msgs = run(kc, SETUP)
        version = "".join(m["content"]["text"] for m in msgs if m["msg_type"] == "stream").strip()
        # The kernel must run this process's Python (and so its ipywidgets): else the test proves nothing.
        assert version == ipywidgets.__version__, (version, ipywidgets.__version__)
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def collect(kc, parent_id, timeout=300):
    """iopub messages of request `parent_id` until the kernel is idle again; raise on an error."""
    msgs = []
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no reply from the kernel in {timeout} s") from None
        if msg["parent_header"].get("msg_id") != parent_id:
            continue
        if msg["msg_type"] == "error":
            raise AssertionError("kernel error:\n" + "\n".join(msg["content"]["traceback"]))
        msgs.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return msgs


def run(kc, code):
    return collect(kc, kc.execute(code))


def send_update(kc, comm_id, state):
    """What a front end sends when the user changes a control: a comm `update` with the new state."""
    msg = kc.session.msg(
        "comm_msg", {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}}
    )
    kc.shell_channel.send(msg)
    return collect(kc, msg["header"]["msg_id"])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_widget_draws_into_its_output_and_redraws_on_update(kernel, name):
    code, control, state = BUILDERS[name]
    front, cell = FrontEnd(), []
    front.feed(run(kernel, f"w = {code}\nw"), cell)

    views = [m["content"]["data"][VIEW]["model_id"] for m in cell if VIEW in m["content"].get("data", {})]
    assert len(views) == 1, f"the cell should show the widget once, got {[m['msg_type'] for m in cell]}"
    box = views[0]
    assert front.models[box]["_model_name"] == "VBoxModel"
    leaked = [m for m in cell if any(k.startswith("image/") for k in m["content"].get("data", {}))]
    assert not leaked, "the figure went to the cell, not into the widget's Output"
    first = front.pictures(box)
    assert len(first) == 1, "the Output widget should show exactly one picture"
    summary = [s["value"] for s in front.state_of(box, "HTMLModel")]
    assert summary and summary[0]

    comm_id = "".join(
        m["content"]["text"] for m in run(kernel, f"print({control}.model_id)") if m["msg_type"] == "stream"
    ).strip()
    assert comm_id in front.tree(box)
    front.feed(send_update(kernel, comm_id, state), cell)
    after = front.pictures(box)
    assert len(after) == 1 and after != first, "the picture was not redrawn"
    assert [s["value"] for s in front.state_of(box, "HTMLModel")] != summary, "the summary line was not updated"
    assert all(s["msg_id"] == "" for s in front.state_of(box, "OutputModel")), "Output still capturing"
