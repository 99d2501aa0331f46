"""``python -m evaluation`` (``make evaluation``): regenerate docs/evaluation.md (``evaluation.document``)."""

import sys

from evaluation.document import main

sys.exit(main())
