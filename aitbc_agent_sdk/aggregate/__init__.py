"""Aggregation, all pure: streaming FedAvg, the robust rules (median, trimmed mean, Krum), norm
clipping, the table of strategies, and the outer optimizers (FedAvg, DiLoCo's Nesterov)."""
