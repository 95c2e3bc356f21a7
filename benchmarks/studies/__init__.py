"""One-off studies on a built scenario or SmolLM2 folder, each printing or writing a markdown section."""
