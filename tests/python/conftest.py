import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_PY = os.path.join(ROOT, "build", "python")
# The package from the build tree unless another one is given (the installed one).
if "TDSTORE_PYTHONPATH" not in os.environ and BUILD_PY not in sys.path:
    sys.path.insert(0, BUILD_PY)
    os.environ["PYTHONPATH"] = BUILD_PY + os.pathsep + os.environ.get("PYTHONPATH", "")


def pytest_report_header(config):
    import tdstore
    return "tdstore from " + os.path.dirname(tdstore.__file__)
