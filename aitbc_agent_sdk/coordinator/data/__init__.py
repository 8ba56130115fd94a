"""A training's inputs: datasets imported and described by a manifest, sealing (keys, wrapped job
keys), shard plans, the inputs of a round built once, the task's code by CID, and text generation
from the training's model."""
