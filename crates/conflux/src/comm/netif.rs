//! Which local address the data listeners bind to: never the wildcard, so that a rank is
//! reachable only on the network the job uses.

use std::net::{IpAddr, SocketAddr, UdpSocket};

use crate::config::Config;
use crate::error::{Error, Result};

/// The address a rank's data listener binds to: the IPv4 address of `CONFLUX_SOCKET_IFNAME`
/// when set (for hosts whose route to the store is not the network the data should use),
/// else the address this host uses to reach the store.
pub(crate) fn data_listen_ip(cfg: &Config, store_addr: SocketAddr) -> Result<IpAddr> {
    match &cfg.socket_ifname {
        Some(name) => interface_ipv4(name),
        None => {
            local_ip_towards(store_addr).map_err(|e| Error::setup("finding the local address towards the store", e))
        }
    }
}

/// The (first) IPv4 address of interface `name`.
pub(crate) fn interface_ipv4(name: &str) -> Result<IpAddr> {
    let all = if_addrs::get_if_addrs().map_err(|e| Error::setup("listing the network interfaces", e))?;
    if let Some(i) = all.iter().find(|i| i.name == name && i.ip().is_ipv4()) {
        return Ok(i.ip());
    }
    let mut names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let why = if names.contains(&name) { "has no IPv4 address" } else { "does not exist" };
    Err(Error::Config(format!(
        "CONFLUX_SOCKET_IFNAME={name:?}: that interface {why} (interfaces: {})",
        names.join(", ")
    )))
}

/// The local address this host uses to reach `target` (no packet is sent).
fn local_ip_towards(target: SocketAddr) -> std::io::Result<IpAddr> {
    let udp = UdpSocket::bind(if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
    udp.connect(target)?;
    Ok(udp.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_by_name_and_towards_itself() {
        assert_eq!(interface_ipv4("lo").unwrap(), IpAddr::from([127, 0, 0, 1]));
        let cfg = Config::default();
        let ip = data_listen_ip(&cfg, "127.0.0.1:29500".parse().unwrap()).unwrap();
        assert_eq!(ip, IpAddr::from([127, 0, 0, 1]));
        let cfg = Config { socket_ifname: Some("lo".into()), ..Config::default() };
        assert_eq!(data_listen_ip(&cfg, "127.0.0.1:1".parse().unwrap()).unwrap(), IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn an_unknown_interface_is_a_configuration_error_naming_it() {
        let e = interface_ipv4("nosuchif0").unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{msg}");
        assert!(msg.contains("\"nosuchif0\"") && msg.contains("does not exist") && msg.contains("lo"), "{msg}");
    }
}
