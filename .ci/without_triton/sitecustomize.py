"""Python as on a machine without triton: on PYTHONPATH, this makes ``import triton`` raise
ImportError and ``importlib.util.find_spec("triton")`` return None, as they do where the
package is not installed (CI's suite without triton, .ci/run), leaving the environment's
triton in place for the checks that run beside it."""

import sys

sys.modules["triton"] = None
