"""Quantization: calibration data, the quantizer, sensitivity, accuracy budgets, the INT8
search and the precision decision."""
