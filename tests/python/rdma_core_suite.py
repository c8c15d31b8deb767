"""Runs rdma-core's own test suite (the directory Debian's python3-pyverbs installs, unpacked in the
current directory) as its run_tests.py does, and prints one line per test for soft-rdma's harness to read:
`SOFT-RDMA-RESULT <outcome> <test id>`, outcome one of ok, skip, fail, error.

Usage: python3 rdma_core_suite.py [run_tests.py's arguments]; tests/tests/rdma_core_programs.rs calls it.
"""
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader

sys.argv = ["run_tests.py"] + sys.argv[1:]
sys.path.insert(0, os.getcwd())
from args_parser import parser  # noqa: E402  (rdma-core's own, from the current directory)

tests = SourceFileLoader("tests", os.path.abspath("__init__.py")).load_module()
parser.parse_args()


class Lines(unittest.TextTestResult):
    def _line(self, outcome, test):
        print(f"SOFT-RDMA-RESULT {outcome} {test.id()}", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line("ok", test)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line("skip", test)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line("fail", test)

    def addError(self, test, err):
        super().addError(test, err)
        self._line("error", test)


unittest.main(module=tests, testRunner=unittest.TextTestRunner(resultclass=Lines, verbosity=2))
