"""Worker scripts run by out-of-process peers in their own Python (see :mod:`adaspec.peers.worker`). Each file is run
as a script, by path, in an environment that need not have adaspec installed: stdlib plus its engine only."""
