"""Small reference models and training loops shared by tests, examples and benchmarks."""
