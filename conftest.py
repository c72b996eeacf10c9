"""pytest setup for every run under this folder (the tests have their own in tests/conftest.py).

nbval: a notebook's kernel that dies before it answers is started again once. On a loaded 2-core CI machine
a kernel can die at start-up for reasons of its own (for example a local port taken between jupyter_client
choosing it and the kernel binding it), and nbval then errors every cell of that notebook. nbval sends the
kernel's stderr to /dev/null; here it goes to a file that the warning (or the error) quotes.
"""

import tempfile
import warnings


def restart_once(start):
    """Wrap nbval's `start_new_kernel(**kwargs)`: a second start when the first kernel dies before replying.

    A death on the second start raises RuntimeError with the kernel's stderr; any other error passes as is.
    """

    def start_new_kernel(**kwargs):
        for last in (False, True):
            stderr = tempfile.TemporaryFile("w+")
            try:
                return start(**{**kwargs, "stderr": stderr})
            except RuntimeError as error:
                if "died" not in str(error):
                    raise
                stderr.seek(0)
                said = stderr.read()[-2000:].strip() or "(nothing)"
                if last:
                    raise RuntimeError(f"{error} (twice); the kernel's stderr: {said}") from error
                warnings.warn(f"nbval: {error}; starting it again. Its stderr: {said}", RuntimeWarning, stacklevel=2)
            finally:
                stderr.close()  # the kernel has its own handle

    return start_new_kernel


def pytest_configure(config):
    if config.pluginmanager.hasplugin("nbval"):
        import nbval.kernel

        nbval.kernel.start_new_kernel = restart_once(nbval.kernel.start_new_kernel)
