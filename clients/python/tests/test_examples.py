"""examples/python/tiers_app.py, run as its docstring says (--demo) against a real node with
docs/examples/tiers.toml: the free tier is held to its quota, the others are not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest

import gossamer
from node import REPO, Node


class TiersAppTest(unittest.TestCase):
    def test_demo_holds_the_free_tier_to_its_burst(self) -> None:
        with open(os.path.join(REPO, "docs", "examples", "tiers.toml")) as f:
            rules = f.read()
        package = os.path.dirname(os.path.dirname(os.path.abspath(gossamer.__file__)))
        with Node(rules) as node:
            run = subprocess.run(
                [sys.executable, os.path.join(REPO, "examples", "python", "tiers_app.py"), "--demo"],
                env={**os.environ, "GOSSAMER_URL": node.url, "PYTHONPATH": package},
                capture_output=True,
                text=True,
                timeout=120,
            )
        self.assertEqual(run.returncode, 0, run.stderr)
        rows = {
            m[0]: (int(m[1]), int(m[2]), int(m[3]))
            for m in re.findall(r"^(\S+)\s+tier \S+\s+(\d+) served,\s+(\d+) rate limited,\s+(\d+) other$",
                                run.stdout, re.M)
        }
        self.assertEqual(set(rows), {"acme-free", "globex-pro", "initech-enterprise"}, run.stdout)
        served, limited, other = rows["acme-free"]
        # A burst of 60, refilled at 1 a second while the 70 calls run (the per-second guard
        # paces them at 20 a second: 3.5 s here, longer on a loaded machine): 60 and a few
        # more, never all 70.
        self.assertGreaterEqual(served, 60, run.stdout)
        self.assertGreaterEqual(limited, 1, run.stdout)
        self.assertEqual((served + limited, other), (70, 0), run.stdout)
        self.assertEqual(rows["globex-pro"], (70, 0, 0), run.stdout)
        self.assertEqual(rows["initech-enterprise"], (70, 0, 0), run.stdout)


if __name__ == "__main__":
    unittest.main()
