"""The tiny DeepSeek-V4 checkpoint generator (scripts/make_tiny_model; contract: docs/tiny-model.md).

formats: bit-exact number formats and block quantizers; st_io: safetensors writer/reader;
model: config, tensor list, master weights, variants; build: directories; cli: the command line.
"""
