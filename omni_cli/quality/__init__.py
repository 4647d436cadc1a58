"""The job's side of scoring (issue 46): settings, attempt seeds and decisions, and the stage that
scores finished rows beside the engine and sends rejected ones back to the scheduler.

The scorers themselves (models, numbers) are runners/scoring's; this package only calls them.
"""

from omni_cli.quality.settings import QualitySettings, quality_settings

__all__ = ["QualitySettings", "quality_settings"]
