"""ONNX graphs: model I/O, inspection, simplify, static shapes, freezing, fusion, compatibility,
offline optimisation, and running a graph on samples."""
