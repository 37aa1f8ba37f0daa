"""`python -m jaxbuffers.cli`: the `jaxbuffers` console script."""

import sys

from jaxbuffers.cli import main

sys.exit(main())
