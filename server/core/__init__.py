"""The request core: the pipeline every pooling route shares, inputs and admission, the engine client, the services."""
