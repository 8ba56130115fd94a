// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {ProviderRegistry, Signatures} from "./ProviderRegistry.sol";

/// @title TrainingEscrow
/// @notice Holds a coordinator's budget (native ETH or one ERC-20) for federated trainings
///         and pays workers per accepted checkpoint. Each worker has a slot capped at the
///         amount committed when opening; whatever is not released goes back to the depositor.
/// @dev The escrow deploys its own ProviderRegistry in the constructor, so the registry trusts
///      exactly one escrow and neither contract has an owner. Payments are pushed with a
///      gas-capped call; a payee whose transfer fails is credited in `owed` and pulls later,
///      so one bad worker cannot block a batch.
///
///      Nobody is given a slot without consent: each worker signs (EIP-191 personal_sign) the
///      digest `keccak256(abi.encode(CONSENT_TAG, block.chainid, address(escrow), trainingId,
///      worker))` (`consentDigest`), or approves it through EIP-1271 when it is a contract. A
///      training's id is `keccak256(abi.encode(coordinator, salt))` (`trainingIdOf`), so an id
///      seen in a pending transaction cannot be taken by anybody else, and a consent is good
///      only for the one coordinator it names through the id.
///
///      The coordinator's acceptance of a round is a receipt it signs (EIP-191, or EIP-1271 for a
///      contract coordinator) over `receiptDigest(trainingId, worker, round, cumulative)`, where
///      `cumulative` is everything it owes that worker in the training so far. Anyone may `redeem`
///      a receipt for the worker, so a coordinator that stops paying cannot keep accepted work
///      unpaid. `refund` therefore keeps back what active slots could still claim (`held`) until
///      `closedAt + CLAIM_WINDOW`; `reclaim` returns what is left after that. At every point
///      `deposited == paid + refunded + held`.
contract TrainingEscrow {
    struct Training {
        address coordinator; // also the depositor: refunds go here
        uint64 deadline;
        bool closed;
        address token; // address(0) for native ETH
        uint64 closedAt; // when `refund` closed it; receipts are redeemable until closedAt + CLAIM_WINDOW
        uint256 deposited;
        uint256 paid;
        uint256 refunded;
    }

    /// @dev One storage word per slot keeps a release to one worker at one SLOAD + one SSTORE.
    struct Slot {
        uint120 amount;
        uint120 paid;
        uint8 status; // SLOT_NONE, SLOT_ACTIVE or SLOT_REPLACED
    }

    uint8 private constant SLOT_NONE = 0;
    uint8 private constant SLOT_ACTIVE = 1;
    uint8 private constant SLOT_REPLACED = 2;

    /// @dev Enough for a contract wallet's receive hook (proxy + event), small enough that a
    ///      hostile receiver cannot burn the whole batch's gas.
    uint256 public constant PUSH_GAS = 30_000;
    /// @dev Cap for one ERC-20 `transfer` push: a standard token to a fresh holder needs ~35k.
    uint256 public constant TOKEN_PUSH_GAS = 100_000;
    /// @notice After `deadline + GRACE_PERIOD` anyone may close a training and refund the depositor.
    uint256 public constant GRACE_PERIOD = 1 days;
    /// @notice The longest a training may run: no deadline can hold a provider's bond longer.
    uint256 public constant MAX_DURATION = 30 days;
    /// @notice Domain tag of the consent digest (see `consentDigest`).
    bytes32 public constant CONSENT_TAG = keccak256("aitbc.consent.v1");
    /// @notice Domain tag of the payment receipt digest (see `receiptDigest`).
    bytes32 public constant RECEIPT_TAG = keccak256("aitbc.receipt.v1");
    /// @notice How long after a refund receipts can still be redeemed against the held slots.
    uint256 public constant CLAIM_WINDOW = 1 hours;

    /// @dev Plain storage, not immutable: the runtime code stays equal to the artifact's, which
    ///      is how the SDK recognises a deployment.
    ProviderRegistry private registryRef;

    mapping(bytes32 => Training) private _trainings;
    mapping(bytes32 => mapping(address => Slot)) private _slots;
    mapping(bytes32 => address[]) private _workers;
    /// @notice Funds that could not be pushed, per token (address(0) = ETH); pulled with `withdraw`.
    mapping(address => mapping(address => uint256)) public owed;
    /// @notice Per training: what `fundVerification` added and `payVerifiers` has not paid yet.
    mapping(bytes32 => uint256) public verificationBudget;

    uint256 private _lock = 1;

    /// @dev `salt` is indexed so that tools knowing only a training's name find its id (any coordinator's).
    event TrainingOpened(
        bytes32 indexed trainingId,
        address indexed coordinator,
        bytes32 indexed salt,
        address token,
        uint256 deposit,
        uint64 deadline
    );
    event SlotOpened(bytes32 indexed trainingId, address indexed worker, uint256 amount);
    event WorkerReplaced(bytes32 indexed trainingId, address indexed oldWorker, address indexed newWorker, uint256 amount);
    event SlotDropped(bytes32 indexed trainingId, address indexed worker);
    event Released(bytes32 indexed trainingId, address indexed worker, uint256 amount, bytes32 resultHash);
    event PaymentDeferred(bytes32 indexed trainingId, address indexed to, uint256 amount);
    event Refunded(bytes32 indexed trainingId, address indexed to, uint256 amount);
    event Redeemed(bytes32 indexed trainingId, address indexed worker, uint64 round, uint256 amount);
    /// @dev What `reclaim` returns to the depositor once the claim window is over.
    event Reclaimed(bytes32 indexed trainingId, address indexed to, uint256 amount);
    event Withdrawn(address indexed to, address indexed token, uint256 amount);
    event VerificationFunded(bytes32 indexed trainingId, uint256 amount);
    event VerifierPaid(bytes32 indexed trainingId, address indexed verifier, uint256 amount, bytes32 evidence);

    error TrainingExists(bytes32 trainingId);
    error UnknownTraining(bytes32 trainingId);
    error NotCoordinator(bytes32 trainingId, address caller);
    error TrainingClosed(bytes32 trainingId);
    error LengthMismatch();
    error NoWorkers();
    error ZeroAddress();
    error ZeroAmount(address worker);
    error AmountTooLarge(address worker);
    error DuplicateWorker(address worker);
    error DepositMismatch(uint256 expected, uint256 sent);
    error DeadlineInPast(uint64 deadline);
    error DeadlineTooFar(uint64 deadline, uint256 latest);
    error NoConsent(address worker);
    error NotAWorker(bytes32 trainingId, address worker);
    error SlotAlreadyPaid(address worker);
    error OverRelease(address worker, uint256 remaining, uint256 requested);
    error RefundTooEarly(bytes32 trainingId, uint256 allowedAt);
    error NothingToRedeem(address worker, uint256 paid, uint256 cumulative);
    error ClaimWindowOver(bytes32 trainingId, uint256 claimableUntil);
    error ClaimWindowOpen(bytes32 trainingId, uint256 claimableUntil);
    error TrainingOpen(bytes32 trainingId);
    error NothingHeld(bytes32 trainingId);
    error NothingOwed(address account);
    error TransferFailed(address to, uint256 amount);
    error Reentrancy();
    error OverVerificationBudget(uint256 remaining, uint256 requested);

    modifier nonReentrant() {
        if (_lock != 1) revert Reentrancy();
        _lock = 2;
        _;
        _lock = 1;
    }

    modifier onlyCoordinator(bytes32 trainingId) {
        Training storage t = _trainings[trainingId];
        if (t.coordinator == address(0)) revert UnknownTraining(trainingId);
        if (t.coordinator != msg.sender) revert NotCoordinator(trainingId, msg.sender);
        if (t.closed) revert TrainingClosed(trainingId);
        _;
    }

    constructor() {
        registryRef = new ProviderRegistry();
    }

    /// @notice The ProviderRegistry this escrow reports assignments and job outcomes to.
    function registry() external view returns (address) {
        return address(registryRef);
    }

    /// @notice The id of the training `coordinator` opens with `salt`.
    function trainingIdOf(address coordinator, bytes32 salt) public pure returns (bytes32) {
        return keccak256(abi.encode(coordinator, salt));
    }

    /// @notice What `worker` signs to accept a slot in `trainingId` (EIP-191 personal_sign).
    function consentDigest(bytes32 trainingId, address worker) public view returns (bytes32) {
        return keccak256(abi.encode(CONSENT_TAG, block.chainid, address(this), trainingId, worker));
    }

    /// @notice What the coordinator signs (EIP-191 personal_sign) to owe `worker` a total of
    ///         `cumulative` in `trainingId` once it accepted `round`; the newest receipt supersedes older ones.
    function receiptDigest(bytes32 trainingId, address worker, uint64 round, uint256 cumulative)
        public
        view
        returns (bytes32)
    {
        return keccak256(abi.encode(RECEIPT_TAG, block.chainid, address(this), trainingId, worker, round, cumulative));
    }

    /// @notice Open the training `trainingIdOf(msg.sender, salt)` with one capped slot per worker,
    ///         each worker's consent signature in `consents`, funded with exactly `sum(amounts)`
    ///         of `token` (msg.value for ETH, else pulled with `transferFrom`, approve first).
    ///         The deadline is at most MAX_DURATION away.
    function open(
        bytes32 salt,
        address token,
        address[] calldata workers,
        uint256[] calldata amounts,
        bytes[] calldata consents,
        uint64 deadline
    ) external payable nonReentrant returns (bytes32 trainingId) {
        trainingId = trainingIdOf(msg.sender, salt);
        if (_trainings[trainingId].coordinator != address(0)) revert TrainingExists(trainingId);
        if (workers.length != amounts.length || workers.length != consents.length) revert LengthMismatch();
        if (workers.length == 0) revert NoWorkers();
        if (deadline <= block.timestamp) revert DeadlineInPast(deadline);
        if (deadline > block.timestamp + MAX_DURATION) revert DeadlineTooFar(deadline, block.timestamp + MAX_DURATION);

        uint256 total;
        address[] storage list = _workers[trainingId];
        for (uint256 i; i < workers.length; ++i) {
            address worker = workers[i];
            uint256 amount = amounts[i];
            if (worker == address(0)) revert ZeroAddress();
            if (amount == 0) revert ZeroAmount(worker);
            if (amount > type(uint120).max) revert AmountTooLarge(worker);
            Slot storage s = _slots[trainingId][worker];
            if (s.status != SLOT_NONE) revert DuplicateWorker(worker);
            _checkConsent(trainingId, worker, consents[i]);
            s.amount = uint120(amount);
            s.status = SLOT_ACTIVE;
            list.push(worker);
            total += amount;
            emit SlotOpened(trainingId, worker, amount);
        }

        _trainings[trainingId] = Training({
            coordinator: msg.sender,
            deadline: deadline,
            closed: false,
            token: token,
            closedAt: 0,
            deposited: total,
            paid: 0,
            refunded: 0
        });
        emit TrainingOpened(trainingId, msg.sender, salt, token, total, deadline);

        if (token == address(0)) {
            if (msg.value != total) revert DepositMismatch(total, msg.value);
        } else {
            if (msg.value != 0) revert DepositMismatch(0, msg.value);
            _pullToken(token, msg.sender, total);
        }
        registryRef.assign(trainingId, workers);
    }

    /// @notice Move a worker's slot, which must not have been paid yet, to another provider that
    ///         consents with `consent`. The old worker is recorded as a failed job in the registry.
    ///         When the new worker already holds its own funded slot (a speculative copy it was
    ///         given with `addWorker`), the old slot is only retired and `consent` is not needed.
    function replaceWorker(bytes32 trainingId, address oldWorker, address newWorker, bytes calldata consent)
        external
        nonReentrant
        onlyCoordinator(trainingId)
    {
        if (newWorker == address(0)) revert ZeroAddress();
        Slot storage old = _slots[trainingId][oldWorker];
        if (old.status != SLOT_ACTIVE) revert NotAWorker(trainingId, oldWorker);
        if (old.paid != 0) revert SlotAlreadyPaid(oldWorker);
        Slot storage fresh = _slots[trainingId][newWorker];
        uint120 amount = old.amount;
        old.amount = 0;
        old.status = SLOT_REPLACED;
        if (fresh.status == SLOT_ACTIVE && newWorker != oldWorker) {
            emit WorkerReplaced(trainingId, oldWorker, newWorker, 0);
            _swapAssignment(trainingId, oldWorker, address(0));
            return;
        }
        if (fresh.status != SLOT_NONE) revert DuplicateWorker(newWorker);
        _checkConsent(trainingId, newWorker, consent);

        fresh.amount = amount;
        fresh.status = SLOT_ACTIVE;
        _workers[trainingId].push(newWorker);
        emit WorkerReplaced(trainingId, oldWorker, newWorker, amount);
        _swapAssignment(trainingId, oldWorker, newWorker);
    }

    /// @dev The registry records the replaced worker's job as failed and assigns the new one.
    function _swapAssignment(bytes32 trainingId, address oldWorker, address newWorker) private {
        address[] memory one = new address[](1);
        uint256[] memory unpaid = new uint256[](1);
        one[0] = oldWorker;
        registryRef.unassign(trainingId, one, unpaid, _trainings[trainingId].token == address(0));
        if (newWorker == address(0)) return;
        one[0] = newWorker;
        registryRef.assign(trainingId, one);
    }

    /// @notice Take back an unpaid worker's slot without recording a failure: the coordinator no
    ///         longer wants its work (a speculative copy that lost the race). Its amount goes back
    ///         to the depositor on close.
    function dropWorker(bytes32 trainingId, address worker) external nonReentrant onlyCoordinator(trainingId) {
        Slot storage s = _slots[trainingId][worker];
        if (s.status != SLOT_ACTIVE) revert NotAWorker(trainingId, worker);
        if (s.paid != 0) revert SlotAlreadyPaid(worker);
        s.amount = 0;
        s.status = SLOT_REPLACED;
        emit SlotDropped(trainingId, worker);
        registryRef.release(trainingId, worker);
    }

    /// @notice Give one more worker, which consents with `consent`, a slot in an open training
    ///         (an elastic pool growing), funded now with exactly `amount` of the training's token:
    ///         msg.value for ETH, else pulled with `transferFrom` (approve first).
    function addWorker(bytes32 trainingId, address worker, uint256 amount, bytes calldata consent)
        external
        payable
        nonReentrant
        onlyCoordinator(trainingId)
    {
        if (worker == address(0)) revert ZeroAddress();
        if (amount == 0) revert ZeroAmount(worker);
        if (amount > type(uint120).max) revert AmountTooLarge(worker);
        Slot storage s = _slots[trainingId][worker];
        if (s.status != SLOT_NONE) revert DuplicateWorker(worker);
        _checkConsent(trainingId, worker, consent);
        s.amount = uint120(amount);
        s.status = SLOT_ACTIVE;
        _workers[trainingId].push(worker);
        Training storage t = _trainings[trainingId];
        t.deposited += amount;
        emit SlotOpened(trainingId, worker, amount);

        if (t.token == address(0)) {
            if (msg.value != amount) revert DepositMismatch(amount, msg.value);
        } else {
            if (msg.value != 0) revert DepositMismatch(0, msg.value);
            _pullToken(t.token, msg.sender, amount);
        }
        address[] memory one = new address[](1);
        one[0] = worker;
        registryRef.assign(trainingId, one);
    }

    /// @notice Pay workers for accepted results; each amount may be a part of the slot's remainder.
    function release(
        bytes32 trainingId,
        address[] calldata workers,
        uint256[] calldata amounts,
        bytes32[] calldata resultHashes
    ) external nonReentrant onlyCoordinator(trainingId) {
        if (workers.length != amounts.length || workers.length != resultHashes.length) {
            revert LengthMismatch();
        }
        if (workers.length == 0) revert NoWorkers();

        // Effects for the whole batch first, then the transfers (checks-effects-interactions).
        uint256 total;
        for (uint256 i; i < workers.length; ++i) {
            _debit(trainingId, workers[i], amounts[i]);
            total += amounts[i];
            emit Released(trainingId, workers[i], amounts[i], resultHashes[i]);
        }
        Training storage t = _trainings[trainingId];
        t.paid += total;

        address token = t.token;
        for (uint256 i; i < workers.length; ++i) {
            _pay(trainingId, token, workers[i], amounts[i]);
        }
    }

    /// @notice Add `amount` to the training's budget for paying its workers per verification (a
    ///         re-execution of another worker's segment): msg.value for ETH, else pulled with
    ///         `transferFrom` (approve first). What `payVerifiers` does not spend is refunded with the
    ///         rest of the deposit: no slot holds it.
    function fundVerification(bytes32 trainingId, uint256 amount)
        external
        payable
        nonReentrant
        onlyCoordinator(trainingId)
    {
        if (amount == 0) revert ZeroAmount(address(0));
        Training storage t = _trainings[trainingId];
        t.deposited += amount;
        verificationBudget[trainingId] += amount;
        emit VerificationFunded(trainingId, amount);
        if (t.token == address(0)) {
            if (msg.value != amount) revert DepositMismatch(amount, msg.value);
        } else {
            if (msg.value != 0) revert DepositMismatch(0, msg.value);
            _pullToken(t.token, msg.sender, amount);
        }
    }

    /// @notice Pay workers of the training (each holds or held a slot) for verifications, from its
    ///         verification budget; each `evidence` names the reports paid for.
    function payVerifiers(
        bytes32 trainingId,
        address[] calldata verifiers,
        uint256[] calldata amounts,
        bytes32[] calldata evidence
    ) external nonReentrant onlyCoordinator(trainingId) {
        if (verifiers.length != amounts.length || verifiers.length != evidence.length) revert LengthMismatch();
        if (verifiers.length == 0) revert NoWorkers();
        uint256 total;
        for (uint256 i; i < verifiers.length; ++i) {
            if (_slots[trainingId][verifiers[i]].status == SLOT_NONE) revert NotAWorker(trainingId, verifiers[i]);
            if (amounts[i] == 0) revert ZeroAmount(verifiers[i]);
            total += amounts[i];
            emit VerifierPaid(trainingId, verifiers[i], amounts[i], evidence[i]);
        }
        uint256 budget = verificationBudget[trainingId];
        if (total > budget) revert OverVerificationBudget(budget, total);
        verificationBudget[trainingId] = budget - total;
        Training storage t = _trainings[trainingId];
        t.paid += total;
        address token = t.token;
        for (uint256 i; i < verifiers.length; ++i) {
            _pay(trainingId, token, verifiers[i], amounts[i]);
        }
    }

    /// @notice Pay `worker` what the coordinator's signed receipt owes it beyond what the slot
    ///         was paid already. Anyone may submit it; the money goes to the worker only. Works
    ///         while the training is open and until `CLAIM_WINDOW` after it was closed.
    function redeem(bytes32 trainingId, address worker, uint64 round, uint256 cumulative, bytes calldata signature)
        external
        nonReentrant
    {
        Training storage t = _trainings[trainingId];
        address coordinator = t.coordinator;
        if (coordinator == address(0)) revert UnknownTraining(trainingId);
        if (t.closed) {
            uint256 until = uint256(t.closedAt) + CLAIM_WINDOW;
            if (block.timestamp >= until) revert ClaimWindowOver(trainingId, until);
        }
        Slot storage s = _slots[trainingId][worker];
        if (s.status != SLOT_ACTIVE) revert NotAWorker(trainingId, worker);
        Signatures.check(
            Signatures.ethSignedMessageHash(receiptDigest(trainingId, worker, round, cumulative)), signature, coordinator
        );
        uint256 slotPaid = s.paid;
        if (cumulative > s.amount) revert OverRelease(worker, s.amount - slotPaid, cumulative - slotPaid);
        if (cumulative <= slotPaid) revert NothingToRedeem(worker, slotPaid, cumulative);
        uint256 amount = cumulative - slotPaid;
        // cumulative <= s.amount, a uint120, so the cast is exact.
        s.paid = uint120(cumulative);
        t.paid += amount;
        emit Redeemed(trainingId, worker, round, amount);
        _pay(trainingId, t.token, worker, amount);
    }

    /// @notice Close the training and return the budget no active slot can still claim to the
    ///         depositor (the coordinator): `deposited - paid - held`, where `held` is what the
    ///         active slots were not paid yet. The held part stays redeemable by receipts until
    ///         `CLAIM_WINDOW` after now, then `reclaim` returns the rest. The coordinator may close
    ///         at any time (declaring the training complete); anyone else only after
    ///         `deadline + GRACE_PERIOD`.
    function refund(bytes32 trainingId) external nonReentrant {
        Training storage t = _trainings[trainingId];
        address coordinator = t.coordinator;
        if (coordinator == address(0)) revert UnknownTraining(trainingId);
        if (t.closed) revert TrainingClosed(trainingId);
        if (msg.sender != coordinator) {
            uint256 allowedAt = uint256(t.deadline) + GRACE_PERIOD;
            if (block.timestamp < allowedAt) revert RefundTooEarly(trainingId, allowedAt);
        }
        // Every still-assigned worker is released in the registry with what it was paid
        // (paid at all = completed); reputation adds up the value, not the number of trainings.
        // The same pass sums what the active slots could still claim with a receipt.
        address[] storage list = _workers[trainingId];
        address[] memory active = new address[](list.length);
        uint256[] memory paid = new uint256[](list.length);
        uint256 n;
        uint256 heldBack;
        for (uint256 i; i < list.length; ++i) {
            Slot storage s = _slots[trainingId][list[i]];
            if (s.status != SLOT_ACTIVE) continue;
            active[n] = list[i];
            paid[n] = s.paid;
            heldBack += s.amount - s.paid;
            ++n;
        }
        assembly {
            mstore(active, n)
            mstore(paid, n)
        }
        uint256 amount = t.deposited - t.paid - heldBack;
        t.closed = true;
        t.closedAt = uint64(block.timestamp);
        t.refunded = amount;
        emit Refunded(trainingId, coordinator, amount);

        registryRef.unassign(trainingId, active, paid, t.token == address(0));

        if (amount != 0) _pay(trainingId, t.token, coordinator, amount);
    }

    /// @notice Once the claim window after the refund is over, return what receipts did not
    ///         claim to the depositor (the coordinator). Anyone may call.
    function reclaim(bytes32 trainingId) external nonReentrant {
        Training storage t = _trainings[trainingId];
        address coordinator = t.coordinator;
        if (coordinator == address(0)) revert UnknownTraining(trainingId);
        if (!t.closed) revert TrainingOpen(trainingId);
        uint256 until = uint256(t.closedAt) + CLAIM_WINDOW;
        if (block.timestamp < until) revert ClaimWindowOpen(trainingId, until);
        uint256 amount = t.deposited - t.paid - t.refunded;
        if (amount == 0) revert NothingHeld(trainingId);
        t.refunded += amount;
        emit Reclaimed(trainingId, coordinator, amount);
        _pay(trainingId, t.token, coordinator, amount);
    }

    /// @notice Pull funds of `token` (address(0) = ETH) whose push failed. Reverts if the
    ///         transfer fails, keeping the balance.
    function withdraw(address token) external nonReentrant {
        uint256 amount = owed[token][msg.sender];
        if (amount == 0) revert NothingOwed(msg.sender);
        owed[token][msg.sender] = 0;
        emit Withdrawn(msg.sender, token, amount);
        // The caller chose to pull, so it gets all remaining gas.
        bool ok;
        if (token == address(0)) {
            (ok,) = payable(msg.sender).call{value: amount}("");
        } else {
            ok = _tokenTransfer(token, msg.sender, amount, gasleft());
        }
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    /// @notice (coordinator, token, deadline, deposited, paid, refunded, closed) of a training.
    function trainings(bytes32 trainingId)
        external
        view
        returns (
            address coordinator,
            address token,
            uint64 deadline,
            uint256 deposited,
            uint256 paid,
            uint256 refunded,
            bool closed
        )
    {
        Training storage t = _trainings[trainingId];
        return (t.coordinator, t.token, t.deadline, t.deposited, t.paid, t.refunded, t.closed);
    }

    /// @notice What the training still holds (`deposited - paid - refunded`: the whole unpaid budget
    ///         while open, what receipts may still claim once closed) and, once closed, until when
    ///         receipts can be redeemed (0 while open: no end yet).
    function held(bytes32 trainingId) external view returns (uint256 amount, uint256 claimableUntil) {
        Training storage t = _trainings[trainingId];
        amount = t.deposited - t.paid - t.refunded;
        if (t.closed) claimableUntil = uint256(t.closedAt) + CLAIM_WINDOW;
    }

    /// @notice (amount, paid) of a worker's slot; (0, 0) when the worker has none.
    function slot(bytes32 trainingId, address worker) external view returns (uint256 amount, uint256 paid) {
        Slot storage s = _slots[trainingId][worker];
        return (s.amount, s.paid);
    }

    /// @notice Whether `account` holds or held (before being replaced) a slot in the training.
    function isWorker(bytes32 trainingId, address account) external view returns (bool) {
        return _slots[trainingId][account].status != SLOT_NONE;
    }

    /// @notice Every address that was given a slot, in order (replacements appended).
    function trainingWorkers(bytes32 trainingId) external view returns (address[] memory) {
        return _workers[trainingId];
    }

    /// @dev Revert unless `worker` signed its consent to a slot in `trainingId` (canonical form only).
    function _checkConsent(bytes32 trainingId, address worker, bytes calldata consent) private view {
        bytes32 hash = Signatures.ethSignedMessageHash(consentDigest(trainingId, worker));
        if (consent.length == 0) revert NoConsent(worker);
        Signatures.check(hash, consent, worker);
    }

    /// @dev Check one payment against the worker's slot and record it.
    function _debit(bytes32 trainingId, address worker, uint256 amount) private {
        Slot storage s = _slots[trainingId][worker];
        if (s.status != SLOT_ACTIVE) revert NotAWorker(trainingId, worker);
        if (amount == 0) revert ZeroAmount(worker);
        uint256 remaining = s.amount - s.paid;
        if (amount > remaining) revert OverRelease(worker, remaining, amount);
        s.paid += uint120(amount);
    }

    /// @dev Push with a gas cap; on failure park the amount in `owed`.
    function _pay(bytes32 trainingId, address token, address to, uint256 amount) private {
        bool ok;
        if (token == address(0)) {
            uint256 gasCap = PUSH_GAS;
            // No return data is copied, so a receiver cannot return-data-bomb the batch.
            assembly {
                ok := call(gasCap, to, amount, 0, 0, 0, 0)
            }
        } else {
            ok = _tokenTransfer(token, to, amount, TOKEN_PUSH_GAS);
        }
        if (!ok) {
            owed[token][to] += amount;
            emit PaymentDeferred(trainingId, to, amount);
        }
    }

    /// @dev `token.transfer(to, amount)`; true when it did not revert and returned nothing or true.
    function _tokenTransfer(address token, address to, uint256 amount, uint256 gasCap) private returns (bool ok) {
        bytes memory data = abi.encodeWithSelector(0xa9059cbb, to, amount);
        assembly {
            mstore(0, 0)
            ok := call(gasCap, token, 0, add(data, 32), mload(data), 0, 32)
            // Accept no return data (old tokens) or a true word; copy at most 32 bytes.
            if ok {
                ok := or(iszero(returndatasize()), and(gt(returndatasize(), 31), eq(mload(0), 1)))
            }
        }
        // A call to an address without code "succeeds"; treat it as a failed transfer.
        if (ok && token.code.length == 0) ok = false;
    }

    /// @dev `transferFrom(from, this, amount)` that must raise our balance by exactly `amount`
    ///      (fee-on-transfer and rebasing tokens are refused).
    function _pullToken(address token, address from, uint256 amount) private {
        if (token.code.length == 0) revert TransferFailed(token, amount);
        uint256 before = _balanceOf(token);
        (bool ok, bytes memory ret) = token.call(abi.encodeWithSelector(0x23b872dd, from, address(this), amount));
        if (!ok || (ret.length != 0 && (ret.length < 32 || abi.decode(ret, (uint256)) != 1))) {
            revert TransferFailed(from, amount);
        }
        uint256 received = _balanceOf(token) - before;
        if (received != amount) revert DepositMismatch(amount, received);
    }

    function _balanceOf(address token) private view returns (uint256) {
        (bool ok, bytes memory ret) = token.staticcall(abi.encodeWithSelector(0x70a08231, address(this)));
        if (!ok || ret.length < 32) revert TransferFailed(token, 0);
        return abi.decode(ret, (uint256));
    }
}
