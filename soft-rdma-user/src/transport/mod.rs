//! Transports: thin drivers that execute the engine's TransportCommands and feed back TransportEvents.
