"""What travels between parties: safetensors checkpoints and data, model updates (float32, bf16, int8
with error feedback), and a task's kept state. Decoders never unpickle and bound what they read."""
