import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD_PY = os.path.join(ROOT, "build", "python")
# The package from the build tree unless another one is given (the installed one).
if "TDSTORE_PYTHONPATH" not in os.environ and BUILD_PY not in sys.path:
    sys.path.insert(0, BUILD_PY)
    os.environ["PYTHONPATH"] = BUILD_PY + os.pathsep + os.environ.get("PYTHONPATH", "")


# Keys and graph caches of the tests' own (tdstore/trust.h), also for the processes they spawn:
# the suite never writes into the home directory of the user running it.
_HOME = tempfile.mkdtemp(prefix="tdstore-test-home-")
atexit.register(shutil.rmtree, _HOME, True)
os.environ["XDG_CONFIG_HOME"] = os.path.join(_HOME, "config")
os.environ["XDG_CACHE_HOME"] = os.path.join(_HOME, "cache")
os.environ.pop("TDSTORE_KEY_FILE", None)


def pytest_report_header(config):
    import tdstore
    return "tdstore from " + os.path.dirname(tdstore.__file__)
