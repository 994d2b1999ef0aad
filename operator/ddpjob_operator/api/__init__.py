"""The DDPJob API: wire names, the typed spec and its template checks, quantities, time and text formats, and the
reasons conditions and Events carry. Imports no other layer of the operator."""
