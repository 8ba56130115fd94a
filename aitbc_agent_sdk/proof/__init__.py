"""Proof of work done: committed trajectories (boundary states, their hashes, the kept ones) and the
opened boundary states a spot check reads back."""
