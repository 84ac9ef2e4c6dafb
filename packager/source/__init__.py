"""Where a model comes from: PyTorch loading, safe weights, tensor specs, export to ONNX."""
