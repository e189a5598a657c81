"""What the tests share: servers in a thread and node processes (each wait with a deadline), the apps the tests run
and their ground truth, clients, and readers of what a node stored. Test modules import from here (or take a
conftest.py fixture); no module imports another test module."""
