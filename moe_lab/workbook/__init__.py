"""The teaching layer of the notebooks: checks (`workbook.check`, `workbook.pick`, ...), `tl.device_print`
shown in the cell on a GPU (`workbook.capture_device_print`), the guarded runner (`moe_lab.workbook.guarded`),
the graded exercises (`moe_lab.workbook.exercises`) and the pictures and widgets (`moe_lab.workbook.viz`,
imported only when used).

    from moe_lab import workbook
    from moe_lab.workbook import exercises
    from moe_lab.workbook.viz import tiles

The kernels and the layer (the modules at the package root) never import this package: `import moe_lab`
does not, and neither does any core module.
"""

from .checks import check, check_equal, expert_rows_matmul, fp32_dot_tol, on_gpu, pick, timing_allowed
from .device_print import capture_device_print

__all__ = [
    "capture_device_print",
    "check",
    "check_equal",
    "expert_rows_matmul",
    "fp32_dot_tol",
    "on_gpu",
    "pick",
    "timing_allowed",
]
