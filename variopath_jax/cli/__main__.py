"""``python -m variopath_jax.cli``: the ``variopath`` command."""

import sys

from variopath_jax.cli import main

sys.exit(main())
