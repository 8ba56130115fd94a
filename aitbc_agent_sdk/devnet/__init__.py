"""Local servers for the devnet and the tests: broker, chain node, IPFS daemon, bound to 127.0.0.1."""
