"""The run pipeline — plan, validate, apply — and its console renderer.  May import core, store, transforms, validation."""
