"""Money on the coordinator's side: the escrow account (the contract seen from the coordinator),
the escrow steps of a training (fund, pay, refund, slash), payouts (pure) and signed receipts."""
