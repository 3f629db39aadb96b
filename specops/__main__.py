"""``python -m specops``: speculative decoding from the command line (``specops.cli``; the
verification-step demo is ``python -m specops.demo``)."""

import sys

from specops.cli import main

main(sys.argv[1:])
