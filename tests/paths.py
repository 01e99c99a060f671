"""Where the tests' files are: the repository, tests/ and bilm-tf's fixture (tests sit in room folders)."""
import os

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
FIXTURE_DIR = os.path.join(TESTS_DIR, "fixtures", "bilm_tf")
FIXTURE_OPTIONS = os.path.join(FIXTURE_DIR, "options.json")
FIXTURE_WEIGHTS = os.path.join(FIXTURE_DIR, "lm_weights.hdf5")
# A tiny TF-Hub elmo/3-layout module written by TensorFlow, and the same weights as bilm-tf's hdf5
# (tests/fixtures/tfhub/make_fixture.py).
TFHUB_DIR = os.path.join(TESTS_DIR, "fixtures", "tfhub")
TFHUB_MODULE = os.path.join(TFHUB_DIR, "module")
TFHUB_BILM = os.path.join(TFHUB_DIR, "bilm")
