"""Integrations of flashattn with other libraries (import each submodule on its own: each needs its library)."""
