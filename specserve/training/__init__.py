"""Making drafts: distil a small EAGLE-style draft from a target model (`specserve train-draft`)."""
