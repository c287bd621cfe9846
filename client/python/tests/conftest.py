"""pytest setup: the package from this checkout (unless ATTND_TEST_INSTALLED is set), the
library and daemon from the build (ATTND_CLIENT_LIB / ATTND_DAEMON, else build/)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if not os.environ.get("ATTND_TEST_INSTALLED"):
    sys.path.insert(0, os.path.dirname(HERE))
