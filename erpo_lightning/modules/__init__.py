"""The LightningModule: `ERPOModule`, its settings, optimizer, metrics, sharding, collectives and LoRA adapters."""
