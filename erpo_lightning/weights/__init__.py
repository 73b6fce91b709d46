"""Model weights in other forms: a `.gguf` file as a Hugging Face folder, a LoRA policy's weights merged."""
