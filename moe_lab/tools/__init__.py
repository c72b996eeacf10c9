"""The tools around the kernels: the `moe-lab` command (`cli`: demo, info, doctor, bench, tune), its
benchmark and tuner (`bench`, `tune`, `timing`), the environment check (`doctor`), and compiling kernels
for a GPU that is not there (`compile_only`, `look_inside`).

The kernels and the layer (the modules at the package root) never import this package; tools import them.
"""
