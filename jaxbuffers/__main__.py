"""`python -m jaxbuffers`: the `jaxbuffers` console script (`jaxbuffers.cli`)."""

import sys

from jaxbuffers.cli import main

sys.exit(main())
