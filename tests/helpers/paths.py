"""Where things are, for a test module wherever it sits in the mirror (tests/unit/<package>/, tests/e2e/)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
