"""The real transformer layer in torch, Megatron style, on one tensor-parallel rank."""
