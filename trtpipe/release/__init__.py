"""Release: channels (named pointers to immutable artifact digests), promotion gates, and the audit trail."""
