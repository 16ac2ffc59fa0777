"""Hypothesis strategies and chex checks for JAX modules."""
