"""Run a scenario module's tests and print each verdict as JSON (last line of output).

Each failure's message is printed before it (``FAILURE name: message``).

Usage: python verdicts_json.py MODULE
Used to compare harnesses on the same file, where log lines would garble -v output.
"""

import importlib
import json
import sys
import unittest


class Recorder(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.verdicts = {}

    def _name(self, test):
        return test.id().split(".", 1)[1]

    def addSuccess(self, test):
        self.verdicts[self._name(test)] = "pass"

    def addFailure(self, test, err):
        self.verdicts[self._name(test)] = "fail"
        print(f"FAILURE {self._name(test)}: {err[1]}", flush=True)

    def addError(self, test, err):
        self.verdicts[self._name(test)] = "error"
        print(f"FAILURE {self._name(test)}: {err[1]}", flush=True)

    def addSkip(self, test, reason):
        self.verdicts[self._name(test)] = f"skip: {reason}"


if __name__ == "__main__":
    module = importlib.import_module(sys.argv[1])
    result = Recorder()
    unittest.defaultTestLoader.loadTestsFromModule(module).run(result)
    sys.stdout.flush()
    print("VERDICTS " + json.dumps(result.verdicts, sort_keys=True))
