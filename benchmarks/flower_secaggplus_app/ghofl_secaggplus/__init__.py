"""Flower App running one SecAgg+ round over fixed client vectors (ghofl benchmark)."""
