"""Jinja2 templates of the generated scripts (shipped as package data `slurmgen.templates`)."""
