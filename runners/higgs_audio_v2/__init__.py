"""Higgs Audio v2: the native model, its runner hooks, its codec and prompt building.

``family.HiggsAudioV2`` is the family's entry (runners/family.py's contract)."""
