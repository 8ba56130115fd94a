"""Training tasks: the task interface and its loop, the built-in tasks (networks, the gpt model), task
packages, a bound task that scores results, the footprint measured in a rehearsal, and the replay of a
committed trajectory. Everything here is torch and pure; no I/O but the files a caller names."""
