"""Simulated users and the online-learning experiment runner.

Users follow cascade click models from online learning-to-rank research
(Oosterhuis & de Rijke, 2018; Hofmann et al., 2013), with explicit thumbs,
implicit reformulations and delayed arrival on top.
"""

from __future__ import annotations

from rlfb.simulation.users import CLICK_MODELS, ClickModel, Interaction, SimulatedFeedback, SimulatedUser

__all__ = ["CLICK_MODELS", "ClickModel", "Interaction", "SimulatedFeedback", "SimulatedUser"]
