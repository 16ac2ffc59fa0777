"""Quantization-aware training and int8 inference for the TFT."""
