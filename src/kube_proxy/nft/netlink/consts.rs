//! The numbers of the nf_tables netlink ABI this encoder uses
//! (`include/uapi/linux/netfilter/nf_tables.h`, `nfnetlink.h`), and of the userdata that nft
//! stores beside the kernel's objects (libnftnl's `udata.h`), which `nft list` reads back.
//! Fixed ABI: these never change meaning.

/// `NFNL_SUBSYS_NFTABLES`: the high byte of every nf_tables message type.
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
/// `NFNL_MSG_BATCH_BEGIN` / `NFNL_MSG_BATCH_END` (`NLMSG_MIN_TYPE` and the next).
pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NFNETLINK_V0: u8 = 0;

/// `NFPROTO_*` of a table's family (the same numbers as `AF_INET` / `AF_INET6`).
pub const NFPROTO_UNSPEC: u8 = 0;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

// enum nf_tables_msg_types
pub const NFT_MSG_NEWTABLE: u16 = 0;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_NEWOBJ: u16 = 18;
pub const NFT_MSG_DELOBJ: u16 = 20;

// enum nft_list_attributes / nft_expr_attributes
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

// enum nft_table_attributes
pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_USERDATA: u16 = 6;

// enum nft_chain_attributes, nft_hook_attributes
pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_CHAIN_USERDATA: u16 = 12;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;

// enum nft_rule_attributes
pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;

// enum nft_set_attributes, nft_set_desc_attributes, nft_set_field_attributes
pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_DESC_SIZE: u16 = 1;

// enum nft_set_flags
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;

// enum nft_set_elem_list_attributes, nft_set_elem_attributes, nft_set_elem_flags
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFTA_SET_ELEM_USERDATA: u16 = 6;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

// enum nft_data_attributes, nft_verdict_attributes, verdicts
pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NF_DROP: i32 = 0;
pub const NF_ACCEPT: i32 = 1;
pub const NFT_JUMP: i32 = -3;
pub const NFT_GOTO: i32 = -4;
pub const NFT_RETURN: i32 = -5;
/// `NFT_DATA_VERDICT`: a map's data type when its values are verdicts.
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

// enum nft_object_attributes, nft_counter_attributes
pub const NFTA_OBJ_TABLE: u16 = 1;
pub const NFTA_OBJ_NAME: u16 = 2;
pub const NFTA_OBJ_TYPE: u16 = 3;
pub const NFTA_OBJ_DATA: u16 = 4;
pub const NFT_OBJECT_COUNTER: u32 = 1;
pub const NFTA_COUNTER_BYTES: u16 = 1;
pub const NFTA_COUNTER_PACKETS: u16 = 2;

// Registers: the verdict register, and the first 128-bit one (nft's numbering, see
// `expr::Reg`).
pub const NFT_REG_VERDICT: u32 = 0;

// Expression attributes, per expression.
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_L4PROTO: u32 = 16;

pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;

pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_BITWISE_OP: u16 = 6;
pub const NFT_BITWISE_BOOL: u32 = 0;

pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFT_LOOKUP_F_INV: u32 = 1;

pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;

pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;

pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
pub const NFTA_FIB_F_SADDR: u32 = 1;
pub const NFTA_FIB_F_DADDR: u32 = 2;

pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_FLAGS: u16 = 7;
pub const NFT_NAT_DNAT: u32 = 1;

pub const NFTA_MASQ_FLAGS: u16 = 1;

pub const NFTA_NUMGEN_DREG: u16 = 1;
pub const NFTA_NUMGEN_MODULUS: u16 = 2;
pub const NFTA_NUMGEN_TYPE: u16 = 3;
pub const NFTA_NUMGEN_OFFSET: u16 = 4;
pub const NFT_NG_INCREMENTAL: u32 = 0;
pub const NFT_NG_RANDOM: u32 = 1;
pub const NFTA_HASH_SREG: u16 = 1;
pub const NFTA_HASH_DREG: u16 = 2;
pub const NFTA_HASH_LEN: u16 = 3;
pub const NFTA_HASH_MODULUS: u16 = 4;
pub const NFTA_HASH_SEED: u16 = 5;
pub const NFTA_HASH_OFFSET: u16 = 6;
pub const NFTA_HASH_TYPE: u16 = 7;
pub const NFT_HASH_JENKINS: u32 = 0;

pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_SET_ID: u16 = 2;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;

pub const NFTA_OBJREF_IMM_TYPE: u16 = 1;
pub const NFTA_OBJREF_IMM_NAME: u16 = 2;

pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;
pub const NFT_REJECT_ICMP_UNREACH: u32 = 0;
/// ICMP "port unreachable" (what a bare `reject` sends): `ICMP_PORT_UNREACH` for IPv4,
/// `ICMPV6_PORT_UNREACH` for IPv6.
pub const ICMP_PORT_UNREACH: u8 = 3;
pub const ICMPV6_PORT_UNREACH: u8 = 4;

/// `NF_NAT_RANGE_PROTO_SPECIFIED`, `NF_NAT_RANGE_PROTO_RANDOM_FULLY`.
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

/// `RTN_LOCAL`: what `fib ... type local` compares with.
pub const RTN_LOCAL: u32 = 2;
/// Conntrack bits: `IP_CT_NEW`'s state bit, `IPS_DST_NAT`.
pub const NF_CT_STATE_NEW_BIT: u32 = 1 << 3;
pub const IPS_DST_NAT: u32 = 1 << 5;

// Netfilter hooks.
pub const NF_INET_PRE_ROUTING: u32 = 0;
pub const NF_INET_LOCAL_IN: u32 = 1;
pub const NF_INET_FORWARD: u32 = 2;
pub const NF_INET_LOCAL_OUT: u32 = 3;
pub const NF_INET_POST_ROUTING: u32 = 4;

/// nft's datatypes as the kernel stores them in a set's key or data type
/// (`enum datatypes` in nft's `datatype.h`; a concatenation shifts each by `TYPE_BITS`).
pub const TYPE_IPADDR: u32 = 7;
pub const TYPE_IP6ADDR: u32 = 8;
pub const TYPE_INET_PROTOCOL: u32 = 12;
pub const TYPE_INET_SERVICE: u32 = 13;
pub const TYPE_BITS: u32 = 6;

// libnftnl's userdata (`enum nftnl_udata_*_types`): TLVs of a one-byte type and a one-byte
// length, numbers in host byte order.
pub const UDATA_COMMENT: u8 = 0;
pub const UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const UDATA_SET_DATABYTEORDER: u8 = 1;
pub const UDATA_SET_MERGE_ELEMENTS: u8 = 2;
pub const UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const UDATA_SET_DATA_TYPEOF: u8 = 4;
pub const UDATA_SET_DATA_INTERVAL: u8 = 6;
pub const UDATA_SET_COMMENT: u8 = 7;
/// Ours, not libnftnl's: a `numgen` map's SHA-256 of its elements (the first 16 bytes), so
/// that a table read back after a restart need not ask for the elements of every such map,
/// one request each, when the wanted map has the same digest (`read`). nft skips userdata
/// types it does not know; the number is far above the ones libnftnl defines.
pub const UDATA_SET_CONTENT_DIGEST: u8 = 0xd1;
pub const UDATA_SET_TYPEOF_EXPR: u8 = 0;
pub const UDATA_SET_TYPEOF_DATA: u8 = 1;
pub const UDATA_SET_ELEM_FLAGS: u8 = 1;
/// `NFTNL_SET_ELEM_F_INTERVAL_OPEN`: an interval that runs to the end of the key's range.
pub const UDATA_SET_ELEM_F_INTERVAL_OPEN: u32 = 0x1;
/// nft's `enum byteorder`, as set userdata records a key's.
pub const BYTEORDER_INVALID: u32 = 0;
pub const BYTEORDER_HOST_ENDIAN: u32 = 1;
pub const BYTEORDER_BIG_ENDIAN: u32 = 2;
/// nft's `enum expr_types` values that set userdata records (`typeof` of a key).
pub const EXPR_CONCAT: u32 = 13;

// What reading a table back needs besides: the get/dump messages and the attributes the
// kernel dumps that nft never sends.
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_NEWGEN: u16 = 15;
pub const NFT_MSG_GETGEN: u16 = 16;
pub const NFT_MSG_GETOBJ: u16 = 19;
pub const NFTA_GEN_ID: u16 = 1;

pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_FLAGS: u16 = 10;
/// `NFT_CHAIN_BASE`: the flag every base chain carries; the others (hardware offload, a
/// rule-bound anonymous chain) are never the proxy's.
pub const NFT_CHAIN_BASE: u32 = 0x1;
pub const NFTA_HOOK_DEV: u16 = 3;
pub const NFTA_HOOK_DEVS: u16 = 4;

pub const NFT_SET_OBJECT: u32 = 0x40;
pub const NFT_SET_EXPR: u32 = 0x100;
pub const NFTA_SET_OBJ_TYPE: u16 = 15;
pub const NFTA_SET_EXPR: u16 = 17;
pub const NFTA_SET_EXPRESSIONS: u16 = 18;
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
pub const NFTA_SET_ELEM_OBJREF: u16 = 9;
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
/// libnftnl's element userdata: the comment (`NFTNL_UDATA_SET_ELEM_COMMENT`).
pub const UDATA_SET_ELEM_COMMENT: u8 = 0;

pub const NFTA_NAT_REG_ADDR_MAX: u16 = 4;
pub const NFTA_NAT_REG_PROTO_MAX: u16 = 6;
/// `NF_NAT_RANGE_MAP_IPS`: the kernel adds it to a NAT statement that has an address, and
/// `NF_NAT_RANGE_PROTO_SPECIFIED` to one that has a port, whatever the flags sent said.
pub const NF_NAT_RANGE_MAP_IPS: u32 = 0x1;
pub const NFTA_MASQ_REG_PROTO_MIN: u16 = 2;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFTA_DYNSET_SREG_DATA: u16 = 5;
pub const NFTA_DYNSET_FLAGS: u16 = 9;
pub const NFTA_CT_DIRECTION: u16 = 3;

/// nft's `TYPE_INTEGER`: the key type of a `numgen` map.
pub const TYPE_INTEGER: u32 = 4;
