"""The folders the tests read: the repository, its labs, the tests' fixtures and what the tests write."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LABS = ROOT / "labs"
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
HELPERS = TESTS / "helpers"
ARTIFACTS = ROOT / "test-artifacts"
