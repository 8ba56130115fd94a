// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

interface IEscrowView {
    function trainings(bytes32 trainingId)
        external
        view
        returns (address, address, uint64, uint256, uint256, uint256, bool);

    function isWorker(bytes32 trainingId, address account) external view returns (bool);
}

/// @notice Canonical signature checks shared by the escrow (consent) and the registry (evidence).
library Signatures {
    uint256 internal constant HALF_ORDER = 0x7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0;
    /// @dev EIP-1271 `isValidSignature` magic value, for workers that are contract wallets.
    bytes4 internal constant ERC1271_MAGIC = 0x1626ba7e;
    uint256 internal constant ERC1271_GAS = 50_000;

    error InvalidSignature();

    function ethSignedMessageHash(bytes32 digest) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked("\x19Ethereum Signed Message:\n32", digest));
    }

    /// @dev The signer of a 65-byte `r || s || v` signature with v in {27, 28} and a low s;
    ///      anything else (and an unrecoverable signature) reverts, so no signature has two forms.
    function recover(bytes32 hash, bytes calldata signature) internal pure returns (address signer) {
        if (signature.length != 65) revert InvalidSignature();
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        if (uint256(s) > HALF_ORDER || (v != 27 && v != 28)) revert InvalidSignature();
        signer = ecrecover(hash, v, r, s);
        if (signer == address(0)) revert InvalidSignature();
    }

    /// @dev Revert unless `account` signed `hash`: ECDSA for a key, EIP-1271 for a contract wallet.
    function check(bytes32 hash, bytes calldata signature, address account) internal view {
        if (account.code.length == 0) {
            if (recover(hash, signature) != account) revert InvalidSignature();
            return;
        }
        (bool ok, bytes memory ret) =
            account.staticcall{gas: ERC1271_GAS}(abi.encodeWithSelector(ERC1271_MAGIC, hash, signature));
        if (!ok || ret.length < 32 || bytes4(abi.decode(ret, (bytes32))) != ERC1271_MAGIC) revert InvalidSignature();
    }
}

/// @title ProviderRegistry
/// @notice Providers bond native ETH and publish the hash of their offer metadata. The
///         registry keeps reputation counters that only its escrow can move, lets a
///         training's coordinator slash a provider that signed a bad result, and lets a
///         provider withdraw only after an unbonding delay and while assigned to no open training.
/// @dev Deployed by TrainingEscrow's constructor; `escrow` (msg.sender at deployment) is the
///      only address allowed to call the assignment hooks. There is no owner.
///
///      Slashing evidence: the provider signs, with EIP-191 `personal_sign`, the 32-byte digest
///      `keccak256(abi.encode(RESULT_TAG, block.chainid, address(registry), trainingId, round,
///      keccak256(bytes(cid))))` where `cid` is the result's CID string (utf-8). Binding the
///      chain, the registry and the round keeps evidence from replaying across deployments,
///      chains and rounds. `resultDigest` returns that digest; the signature is 65 bytes
///      `r || s || v` with v in {27, 28} and a low-s value.
///
///      Reputation is value, not a count: `earned` adds up the wei of native ETH each provider
///      was paid through the escrow (ERC-20 payments add nothing: a worthless token would
///      forge any amount). `completed` and `failed` count consented assignments only, since
///      the escrow assigns nobody without the provider's signature.
contract ProviderRegistry {
    struct Provider {
        uint128 stake;
        uint64 unbondingAt; // 0 when not unbonding
        bool registered;
        bool listed; // in _providerList already (the list is append-only)
        uint32 assigned; // open trainings holding a slot for this provider
        uint32 completed;
        uint32 failed;
        uint32 slashes;
        uint128 earned; // wei of native ETH paid to the provider through the escrow
        bytes32 metadataHash;
    }

    uint256 public constant MIN_STAKE = 0.001 ether;
    uint256 public constant UNBONDING_DELAY = 7 days;
    /// @notice Share of the current bond that one slash takes, in basis points.
    uint256 public constant SLASH_BPS = 5_000;

    /// @notice Domain tag of the result digest (see `resultDigest`).
    bytes32 public constant RESULT_TAG = keccak256("aitbc.result.v1");

    address public escrow;
    mapping(address => Provider) private _providers;
    address[] private _providerList;
    /// @notice Wei slashed from bonds so far: it stays locked in this contract for good (burned).
    uint256 public burned;
    /// @notice Whether a provider was already slashed for a training (at most once per training).
    mapping(bytes32 => mapping(address => bool)) public slashed;

    uint256 private _lock = 1;

    event ProviderRegistered(address indexed provider, uint256 stake, bytes32 metadataHash);
    event ProviderUpdated(address indexed provider, uint256 stake, bytes32 metadataHash);
    event UnbondingStarted(address indexed provider, uint256 unbondingAt);
    event StakeWithdrawn(address indexed provider, uint256 amount);
    event Assigned(bytes32 indexed trainingId, address indexed provider);
    event Unassigned(bytes32 indexed trainingId, address indexed provider);
    event JobRecorded(bytes32 indexed trainingId, address indexed provider, bool completed, uint256 earned);
    event Slashed(
        bytes32 indexed trainingId,
        address indexed provider,
        address indexed coordinator,
        uint256 amount,
        uint64 round,
        bytes32 cidHash
    );

    error NotEscrow(address caller);
    error AlreadyRegistered(address provider);
    error NotRegistered(address provider);
    error StakeTooLow(uint256 minimum, uint256 sent);
    error ZeroMetadata();
    error AlreadyUnbonding(address provider);
    error NotUnbonding(address provider);
    error UnbondingPending(uint256 unbondingAt);
    error ProviderAssigned(address provider, uint256 trainings);
    error NotCoordinator(bytes32 trainingId, address caller);
    error NotAWorker(bytes32 trainingId, address provider);
    error AlreadySlashed(bytes32 trainingId, address provider);
    error NothingToSlash(address provider);
    error LengthMismatch();
    error TransferFailed(address to, uint256 amount);
    error Reentrancy();

    modifier nonReentrant() {
        if (_lock != 1) revert Reentrancy();
        _lock = 2;
        _;
        _lock = 1;
    }

    modifier onlyEscrow() {
        if (msg.sender != escrow) revert NotEscrow(msg.sender);
        _;
    }

    constructor() {
        escrow = msg.sender;
    }

    // --- providers ------------------------------------------------------------------------

    /// @notice Register the caller with msg.value as its bond and the hash of its offer metadata.
    function register(bytes32 metadataHash) external payable nonReentrant {
        Provider storage p = _providers[msg.sender];
        if (p.registered) revert AlreadyRegistered(msg.sender);
        if (metadataHash == bytes32(0)) revert ZeroMetadata();
        if (msg.value < MIN_STAKE) revert StakeTooLow(MIN_STAKE, msg.value);
        // Reputation counters survive a withdraw and re-registration: they belong to the address.
        if (!p.listed) {
            p.listed = true;
            _providerList.push(msg.sender);
        }
        p.registered = true;
        p.stake += uint128(msg.value);
        p.metadataHash = metadataHash;
        emit ProviderRegistered(msg.sender, p.stake, metadataHash);
    }

    /// @notice Replace the metadata hash and add msg.value to the bond; cancels a pending unbonding.
    function update(bytes32 metadataHash) external payable nonReentrant {
        Provider storage p = _providers[msg.sender];
        if (!p.registered) revert NotRegistered(msg.sender);
        if (metadataHash == bytes32(0)) revert ZeroMetadata();
        p.stake += uint128(msg.value);
        p.metadataHash = metadataHash;
        p.unbondingAt = 0;
        emit ProviderUpdated(msg.sender, p.stake, metadataHash);
    }

    /// @notice Start the unbonding delay; `withdraw` is possible once it has passed.
    function beginUnbonding() external nonReentrant {
        Provider storage p = _providers[msg.sender];
        if (!p.registered) revert NotRegistered(msg.sender);
        if (p.unbondingAt != 0) revert AlreadyUnbonding(msg.sender);
        p.unbondingAt = uint64(block.timestamp + UNBONDING_DELAY);
        emit UnbondingStarted(msg.sender, p.unbondingAt);
    }

    /// @notice Take the whole bond back and deregister: only after the unbonding delay and while
    ///         not assigned to any open training.
    function withdraw() external nonReentrant {
        Provider storage p = _providers[msg.sender];
        if (!p.registered) revert NotRegistered(msg.sender);
        if (p.unbondingAt == 0) revert NotUnbonding(msg.sender);
        if (block.timestamp < p.unbondingAt) revert UnbondingPending(p.unbondingAt);
        if (p.assigned != 0) revert ProviderAssigned(msg.sender, p.assigned);
        uint256 amount = p.stake;
        p.stake = 0;
        p.registered = false;
        p.unbondingAt = 0;
        p.metadataHash = bytes32(0);
        emit StakeWithdrawn(msg.sender, amount);
        (bool ok,) = payable(msg.sender).call{value: amount}("");
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // --- slashing -------------------------------------------------------------------------

    /// @notice The digest a provider signs (EIP-191 personal_sign) over a result it submits.
    function resultDigest(bytes32 trainingId, uint64 round, string calldata cid) public view returns (bytes32) {
        return keccak256(abi.encode(RESULT_TAG, block.chainid, address(this), trainingId, round, keccak256(bytes(cid))));
    }

    /// @notice Slash `provider` for a result it signed in `round` that failed verification. Only
    ///         the training's coordinator may call, once per (training, provider), and only for a
    ///         provider that holds or held a slot there (so it consented). SLASH_BPS of the bond is
    ///         burned, not paid to the caller: the chain cannot re-check the fault, so a slash must
    ///         never be worth money to whoever calls it.
    function slash(bytes32 trainingId, uint64 round, address provider, string calldata cid, bytes calldata signature)
        external
        nonReentrant
        returns (uint256 amount)
    {
        (address coordinator,,,,,,) = IEscrowView(escrow).trainings(trainingId);
        if (coordinator == address(0) || coordinator != msg.sender) revert NotCoordinator(trainingId, msg.sender);
        bytes32 digest = resultDigest(trainingId, round, cid);
        if (Signatures.recover(Signatures.ethSignedMessageHash(digest), signature) != provider) {
            revert Signatures.InvalidSignature();
        }
        if (!IEscrowView(escrow).isWorker(trainingId, provider)) revert NotAWorker(trainingId, provider);
        if (slashed[trainingId][provider]) revert AlreadySlashed(trainingId, provider);
        Provider storage p = _providers[provider];
        if (p.stake == 0) revert NothingToSlash(provider);

        amount = (uint256(p.stake) * SLASH_BPS) / 10_000;
        if (amount == 0) amount = p.stake;
        slashed[trainingId][provider] = true;
        p.stake -= uint128(amount);
        p.slashes += 1;
        burned += amount;
        emit Slashed(trainingId, provider, msg.sender, amount, round, keccak256(bytes(cid)));
    }

    // --- escrow hooks -----------------------------------------------------------------------

    /// @notice The escrow gave each provider a slot in an open training.
    function assign(bytes32 trainingId, address[] calldata providers) external onlyEscrow {
        for (uint256 i; i < providers.length; ++i) {
            _providers[providers[i]].assigned += 1;
            emit Assigned(trainingId, providers[i]);
        }
    }

    /// @notice The providers left the training (closed, or replaced): record each job's outcome.
    ///         `paid[i]` is what the escrow paid provider i in this training (0: the job failed);
    ///         it adds to `earned` only for native-ETH trainings (`native`).
    function unassign(bytes32 trainingId, address[] calldata providers, uint256[] calldata paid, bool native)
        external
        onlyEscrow
    {
        if (providers.length != paid.length) revert LengthMismatch();
        for (uint256 i; i < providers.length; ++i) {
            Provider storage p = _providers[providers[i]];
            p.assigned -= 1;
            bool completed = paid[i] != 0;
            uint256 earned = native ? paid[i] : 0;
            if (completed) p.completed += 1;
            else p.failed += 1;
            if (earned != 0) p.earned += uint128(earned);
            emit JobRecorded(trainingId, providers[i], completed, earned);
        }
    }

    /// @notice The provider's slot was taken back unused (its work was not wanted): no outcome.
    function release(bytes32 trainingId, address provider) external onlyEscrow {
        _providers[provider].assigned -= 1;
        emit Unassigned(trainingId, provider);
    }

    // --- views ------------------------------------------------------------------------------

    /// @notice Bond, metadata, unbonding time and reputation (counters, and wei of ETH earned) of `account`.
    function providerInfo(address account)
        external
        view
        returns (
            uint256 stake,
            bytes32 metadataHash,
            bool registered,
            uint256 unbondingAt,
            uint256 assigned,
            uint256 completed,
            uint256 failed,
            uint256 slashes,
            uint256 earned
        )
    {
        Provider storage p = _providers[account];
        return (
            p.stake, p.metadataHash, p.registered, p.unbondingAt, p.assigned, p.completed, p.failed, p.slashes, p.earned
        );
    }

    /// @notice `providerInfo` for many accounts in one call: discovery reads a whole market's bonds and
    /// reputations at once rather than one round trip per offer.
    function providerInfos(address[] calldata accounts) external view returns (Provider[] memory infos) {
        infos = new Provider[](accounts.length);
        for (uint256 i = 0; i < accounts.length; i++) {
            infos[i] = _providers[accounts[i]];
        }
    }

    /// @notice Every address that ever registered (check `registered` in `providerInfo`).
    function allProviders() external view returns (address[] memory) {
        return _providerList;
    }
}
